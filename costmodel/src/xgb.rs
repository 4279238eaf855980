//! The XGBoost cost model (xgboost-rs, which vendors XGBoost 1.6.2).
//!
//! Ansor's recipe: regression on normalized throughput with the same value as the row
//! weight (fast candidates matter most), max depth 10, eta 0.2, gamma 0.001,
//! min_child_weight 0; retrained from scratch on all data after each round; random
//! scores until more than 100 rows were seen. Instead of Ansor's early stopping over up
//! to 10000 rounds, a fixed number of boosting rounds (default 200) keeps retraining
//! time predictable, and the trees are grown on histograms (`tree_method=hist`) rather
//! than XGBoost's default exact splits: on an 11712-record ResNet log, training on 70%
//! took 0.7 s instead of 5.8 s (2 cores) with the same held-out ranking quality
//! (pairwise accuracy 0.941 vs 0.944, top-10 recall 0.577 for both).
//!
//! A retraining from scratch costs 1.3-1.5 s on a Hopper host once the shipped model's
//! 8213 rows are in; with racing, that is longer than a round takes to measure on several
//! GPUs. With `residual_rounds` above 0, only every `full_every`-th retraining is from
//! scratch: the others fit a few trees, on every row, to what the last model trained from
//! scratch still gets wrong (its predictions are the rows' base margins), and predictions
//! add them to that model's. Retrainings run in order on one thread, so a residual one
//! always fits the model from scratch that was asked for before it. `tune` does so by
//! default (`RESIDUAL_ROUNDS`).
//!
//! A saved model holds its training data as well as the booster, so that a warm start
//! (`--model-in`, e.g. from another network's log) keeps learning from both. The project
//! ships one for Hopper (`shipped`), trained on its committed tuning records (see
//! `models/README.md`), which `tune` starts from by default: it ranks a new task's first
//! round instead of random scores, and keeps learning as a warm start does. A model file
//! may be gzipped.

use crate::random::random_scores;
use crate::{CostModel, Dataset, Fit, Fitted, ModelError};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use xgboost_rs::{Booster, DMatrix};

/// Training settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct XgbParams {
    pub rounds: u32,
    pub max_depth: u32,
    pub eta: f32,
    pub gamma: f32,
    pub min_child_weight: f32,
    /// Rows needed before predictions stop being random.
    pub min_rows: usize,
    /// Boosting rounds of a residual retraining (see the module's doc); 0: every
    /// retraining is from scratch.
    #[serde(default)]
    pub residual_rounds: u32,
    /// With residual retrainings, every this-many-th retraining is from scratch.
    #[serde(default = "default_full_every")]
    pub full_every: u32,
    /// Histogram bins per feature (XGBoost's `max_bin`) of the retrainings to come; a
    /// model saved without it retrains with the default too.
    #[serde(default = "default_max_bin")]
    pub max_bin: u32,
}

/// 64 bins, not XGBoost's 256: retraining after every round of a tune spends most of its
/// time enumerating splits over the bins. Replaying three logs round by round, 64 bins
/// trained in 53-59% of the time and ranked the next round as well (pairwise accuracy
/// 0.717 against 0.703, 0.788 against 0.779, 0.691 against 0.693;
/// `benchmarks/results/cpu-2026-11-29/max-bin/`).
fn default_max_bin() -> u32 {
    64
}

fn default_full_every() -> u32 {
    8
}

/// `tune`'s residual retrainings by default: 20 trees between retrainings from scratch.
/// On four H200s (1536 resnet trials) they cut the tuner's wait for its model from 28.6
/// to 9.0 s and the wall time from 34.9 to 20.2 s; the 240 s GEMM set and resnet fp16 at
/// 120 s reached the same speedups over the vendor as with every retraining from
/// scratch (`benchmarks/results/h200-2026-11-28/`).
pub const RESIDUAL_ROUNDS: u32 = 20;

impl Default for XgbParams {
    fn default() -> Self {
        XgbParams {
            rounds: 200,
            max_depth: 10,
            eta: 0.2,
            gamma: 0.001,
            min_child_weight: 0.0,
            min_rows: 100,
            residual_rounds: 0,
            full_every: default_full_every(),
            max_bin: default_max_bin(),
        }
    }
}

/// What a model file holds.
#[derive(Serialize, Deserialize)]
struct ModelFile {
    format: String,
    feature_names: Vec<String>,
    params: XgbParams,
    data: Dataset,
    /// The booster in XGBoost's JSON format (absent if never trained).
    booster: Option<String>,
}

const FORMAT: &str = "tilesched-xgboost-1";

/// The model shipped for Hopper, and how errors name it.
const HOPPER: &[u8] = include_bytes!("../models/hopper.json.gz");
const SHIPPED_HOPPER: &str = "costmodel/models/hopper.json.gz (shipped)";

/// A booster shared by the tuner's predictions and the training thread's base margins.
type Shared = Arc<Mutex<Booster>>;

pub struct XgbModel {
    feature_names: Vec<String>,
    params: XgbParams,
    data: Dataset,
    /// The last model trained from scratch, and the trees fit to what it gets wrong.
    booster: Option<Shared>,
    residual: Option<Shared>,
    /// The last model from scratch as the training thread has it: set by each full
    /// retraining when it runs, read by the residual ones after it.
    trained_base: Arc<Mutex<Option<Shared>>>,
    /// Retrainings asked for since the last one from scratch (None: none asked yet).
    since_full: Option<u32>,
    rng: ChaCha8Rng,
}

fn xgb_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Xgboost(e.to_string())
}

impl XgbModel {
    pub fn new(feature_names: Vec<String>, params: XgbParams, seed: u64) -> Self {
        XgbModel {
            data: Dataset::new(feature_names.len()),
            feature_names,
            params,
            booster: None,
            residual: None,
            trained_base: Arc::new(Mutex::new(None)),
            since_full: None,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Retrains with `residual_rounds` trees on the last model from scratch, and from
    /// scratch every `full_every`-th time (0 rounds: always from scratch).
    pub fn set_residual(&mut self, residual_rounds: u32, full_every: u32) {
        self.params.residual_rounds = residual_rounds;
        self.params.full_every = full_every.max(1);
    }

    /// Trains from now on with `max_bin` histogram bins per feature (at least 2).
    pub fn set_max_bin(&mut self, max_bin: u32) {
        self.params.max_bin = max_bin.max(2);
    }

    /// Loads a saved model (gzipped or not); its features must be `feature_names`.
    pub fn load(path: &Path, feature_names: &[String], seed: u64) -> Result<Self, ModelError> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_bytes(&bytes, &path.display().to_string(), feature_names, seed)
    }

    /// The model shipped for GPUs of compute capability `cc` (Hopper's), if there is
    /// one; its features must be `feature_names`.
    pub fn shipped(
        cc: (u32, u32),
        feature_names: &[String],
        seed: u64,
    ) -> Option<Result<Self, ModelError>> {
        (cc == (9, 0)).then(|| Self::from_bytes(HOPPER, SHIPPED_HOPPER, feature_names, seed))
    }

    /// A saved model from its bytes; `origin` names it in errors.
    fn from_bytes(
        bytes: &[u8],
        origin: &str,
        feature_names: &[String],
        seed: u64,
    ) -> Result<Self, ModelError> {
        let path = Path::new(origin);
        let read = |message: String| ModelError::Read {
            path: path.display().to_string(),
            message,
        };
        let text = if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(bytes), &mut text)
                .map_err(|e| read(e.to_string()))?;
            text
        } else {
            String::from_utf8(bytes.to_vec()).map_err(|e| read(e.to_string()))?
        };
        let file: ModelFile = serde_json::from_str(&text).map_err(|e| read(e.to_string()))?;
        if file.format != FORMAT {
            return Err(read(format!(
                "format '{}', expected '{FORMAT}'",
                file.format
            )));
        }
        if let Some(difference) = feature_difference(&file.feature_names, feature_names) {
            return Err(ModelError::Features {
                path: path.display().to_string(),
                difference,
            });
        }
        // The training rows must fit the features (a hand-edited or truncated file
        // would otherwise fail at the first update, deep in a tuning run).
        let data = &file.data;
        let n = data.tasks.len();
        if data.width != feature_names.len()
            || data.rows.len() != n * data.width
            || data.us.len() != n
        {
            return Err(read(format!(
                "its training data holds {} values for {n} rows of width {} (expected width {})",
                data.rows.len(),
                data.width,
                feature_names.len()
            )));
        }
        let booster = file
            .booster
            .map(|json| Booster::load_buffer(json.as_bytes()).map_err(xgb_err))
            .transpose()?
            .map(|b| Arc::new(Mutex::new(b)));
        Ok(XgbModel {
            feature_names: file.feature_names,
            params: file.params,
            data: file.data,
            residual: None,
            trained_base: Arc::new(Mutex::new(booster.clone())),
            since_full: booster.as_ref().map(|_| 0),
            booster,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }
}

/// Trains a booster of `rounds` trees on `rows` (flattened, `n` rows) with Ansor's label
/// and row weight, starting from `margins` (another model's predictions) where given.
fn train(
    rows: &[f32],
    n: usize,
    labels: &[f32],
    margins: Option<&[f32]>,
    rounds: u32,
    p: XgbParams,
) -> Result<Booster, ModelError> {
    let mut dtrain = DMatrix::from_dense(rows, n).map_err(xgb_err)?;
    dtrain.set_labels(labels).map_err(xgb_err)?;
    dtrain.set_weights(labels).map_err(xgb_err)?;
    if let Some(margins) = margins {
        dtrain.set_base_margin(margins).map_err(xgb_err)?;
    }
    let config: HashMap<String, String> = [
        ("objective", "reg:squarederror".to_string()),
        ("max_depth", p.max_depth.to_string()),
        ("eta", p.eta.to_string()),
        ("gamma", p.gamma.to_string()),
        ("min_child_weight", p.min_child_weight.to_string()),
        ("verbosity", "0".to_string()),
        ("tree_method", "hist".to_string()),
        ("max_bin", p.max_bin.to_string()),
        ("nthread", training_threads().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut booster = Booster::new_with_json_config(&[&dtrain], config).map_err(xgb_err)?;
    for round in 0..rounds {
        booster.update(&dtrain, round as i32).map_err(xgb_err)?;
    }
    Ok(booster)
}

/// `booster`'s predictions for `rows` (flattened, `n` rows), from `margins` where given.
fn predict_with(
    booster: &Shared,
    rows: &[f32],
    n: usize,
    margins: Option<&[f32]>,
) -> Result<Vec<f32>, ModelError> {
    let mut m = DMatrix::from_dense(rows, n).map_err(xgb_err)?;
    if let Some(margins) = margins {
        m.set_base_margin(margins).map_err(xgb_err)?;
    }
    let b = booster.lock().unwrap_or_else(|e| e.into_inner());
    b.predict(&m).map_err(xgb_err)
}

/// Threads of one training: at most 8. With all 16 cores of the H100 machine, OpenMP's
/// threads contended with the tuner's build threads and measurement worker: training
/// took 0.3 to 4.9 s a round (232 s in a 568 s run); with 8, 0.47 s on average.
fn training_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// How the features a model was saved with differ from this build's, if they do: a
/// model's trees index features by position, so any change of count, order or meaning
/// (names stand for meanings) makes its predictions garbage rather than merely worse.
fn feature_difference(saved: &[String], now: &[String]) -> Option<String> {
    if saved.len() != now.len() {
        return Some(format!(
            "{} features saved, {} in this build",
            saved.len(),
            now.len()
        ));
    }
    let i = saved.iter().zip(now).position(|(a, b)| a != b)?;
    Some(format!(
        "feature {i} is '{}' in the model, '{}' in this build",
        saved[i], now[i]
    ))
}

impl CostModel for XgbModel {
    fn name(&self) -> &'static str {
        "xgboost"
    }

    fn learn(&mut self, measured: &Dataset) -> Option<Fit> {
        self.data.extend(measured);
        // Nothing to learn from until some candidate of some task succeeded.
        if self.data.len() <= self.params.min_rows || self.data.us.iter().all(Option::is_none) {
            return None;
        }
        let (rows, n, labels, params) = (
            self.data.rows.clone(),
            self.data.len(),
            self.data.labels(),
            self.params,
        );
        let base = self.trained_base.clone();
        let residual = params.residual_rounds > 0
            && self.since_full.is_some_and(|k| k + 1 < params.full_every);
        self.since_full = Some(if residual {
            self.since_full.unwrap_or(0) + 1
        } else {
            0
        });
        Some(Fit(Box::new(move || {
            // A residual retraining fits trees to what the last model from scratch gets
            // wrong: its predictions are the rows' base margins.
            let margins = if residual {
                let last = base
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .ok_or_else(|| xgb_err("a residual retraining before any from scratch"))?;
                Some(predict_with(&last, &rows, n, None)?)
            } else {
                None
            };
            let rounds = if residual {
                params.residual_rounds
            } else {
                params.rounds
            };
            let trained = train(&rows, n, &labels, margins.as_deref(), rounds, params)?;
            let booster = Arc::new(Mutex::new(trained));
            if !residual {
                *base.lock().unwrap_or_else(|e| e.into_inner()) = Some(booster.clone());
            }
            Ok(Fitted { booster, residual })
        })))
    }

    fn install(&mut self, fitted: Fitted) {
        if fitted.residual {
            self.residual = Some(fitted.booster);
        } else {
            self.booster = Some(fitted.booster);
            self.residual = None;
        }
    }

    fn predict(&mut self, rows: &[f32]) -> Vec<f32> {
        let n = rows.len() / self.data.width.max(1);
        if n == 0 {
            return Vec::new();
        }
        let predicted = self.booster.as_ref().and_then(|b| {
            let base = predict_with(b, rows, n, None).ok()?;
            match &self.residual {
                None => Some(base),
                Some(r) => predict_with(r, rows, n, Some(&base)).ok(),
            }
        });
        predicted.unwrap_or_else(|| random_scores(&mut self.rng, n))
    }

    fn training_rows(&self) -> usize {
        self.data.len()
    }

    fn save(&self, path: &Path) -> Result<(), ModelError> {
        let write = |message: String| ModelError::Write {
            path: path.display().to_string(),
            message,
        };
        // The model from scratch, without a residual's trees: the saved data is whole,
        // so the next retraining after loading makes up for them.
        let booster = self
            .booster
            .as_ref()
            .map(|b| {
                let b = b.lock().unwrap_or_else(|e| e.into_inner());
                b.save_to_buffer("json".to_string()).map_err(xgb_err)
            })
            .transpose()?;
        let file = ModelFile {
            format: FORMAT.to_string(),
            feature_names: self.feature_names.clone(),
            params: self.params,
            data: self.data.clone(),
            booster,
        };
        let text = serde_json::to_string(&file).map_err(|e| write(e.to_string()))?;
        if path.extension().is_some_and(|e| e == "gz") {
            let out = std::fs::File::create(path).map_err(|e| write(e.to_string()))?;
            let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::best());
            std::io::Write::write_all(&mut gz, text.as_bytes())
                .map_err(|e| write(e.to_string()))?;
            return gz.finish().map(|_| ()).map_err(|e| write(e.to_string()));
        }
        std::fs::write(path, text).map_err(|e| write(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of 3 features where the time is a known function of the first two.
    fn synthetic(n: usize, task: &str) -> Dataset {
        let mut d = Dataset::new(3);
        for i in 0..n {
            let (a, b) = ((i % 7) as f32, (i % 5) as f32);
            let us = 10.0 + 3.0 * f64::from(a) + f64::from(b * b);
            d.push(
                &[a, b, (i % 3) as f32],
                task,
                if i % 11 == 0 { None } else { Some(us) },
            );
        }
        d
    }

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into(), "c".into()]
    }

    #[test]
    fn residual_retrainings_add_to_the_last_model_from_scratch() {
        let params = XgbParams {
            rounds: 30,
            ..XgbParams::default()
        };
        let mut m = XgbModel::new(names(), params, 1);
        m.set_residual(10, 3);
        let mut kinds = Vec::new();
        for i in 0..5 {
            let fit = m.learn(&synthetic(120, &format!("t{}", i % 2))).unwrap();
            let fitted = fit.run().unwrap();
            kinds.push(fitted.residual);
            m.install(fitted);
        }
        assert_eq!(
            kinds,
            [false, true, true, false, true],
            "from scratch every third"
        );
        assert!(m.residual.is_some());
        // Fastest (a=0,b=0) above slowest (a=6,b=4), with the residual's trees added.
        let p = m.predict(&[0.0, 0.0, 0.0, 6.0, 4.0, 0.0]);
        assert!(p[0] > p[1], "{p:?}");
        // The next from scratch (the seventh) drops the residual the model had.
        for full in [false, true] {
            let fitted = m.learn(&synthetic(10, "t0")).unwrap().run().unwrap();
            assert_eq!(fitted.residual, !full);
            m.install(fitted);
        }
        assert!(m.residual.is_none());
    }

    #[test]
    fn training_cuts_each_feature_into_max_bin_bins() {
        // Every (a, b) of the synthetic rows, c = 0: how many different predictions.
        let grid: Vec<f32> = (0..7)
            .flat_map(|a| (0..5).flat_map(move |b| [a as f32, b as f32, 0.0]))
            .collect();
        let distinct = |max_bin: u32| {
            let mut m = XgbModel::new(names(), XgbParams::default(), 1);
            m.set_max_bin(max_bin);
            m.update(&synthetic(400, "t")).unwrap();
            let mut p = m.predict(&grid);
            p.sort_by(f32::total_cmp);
            p.dedup();
            p.len()
        };
        // With 2 bins XGBoost keeps at most 2 cuts per feature: at most 3 x 3 regions
        // of (a, b); with the default every one of the 7 x 5 points can differ.
        let (few, default) = (distinct(2), distinct(XgbParams::default().max_bin));
        assert!(few <= 9 && default > 9, "{few} {default}");
    }

    #[test]
    fn random_until_enough_rows_then_it_ranks_what_it_learned() {
        let mut m = XgbModel::new(names(), XgbParams::default(), 1);
        m.update(&synthetic(50, "t")).unwrap();
        assert!(m.booster.is_none(), "50 rows: still random");
        m.update(&synthetic(150, "t")).unwrap();
        assert!(m.booster.is_some());
        // Fastest (a=0,b=0) above slowest (a=6,b=4).
        let p = m.predict(&[0.0, 0.0, 0.0, 6.0, 4.0, 0.0]);
        assert!(p[0] > p[1], "{p:?}");
    }

    #[test]
    fn save_and_load_round_trip_with_data_and_booster() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        let mut m = XgbModel::new(names(), XgbParams::default(), 1);
        m.update(&synthetic(200, "t")).unwrap();
        m.save(&path).unwrap();
        let probe = [1.0, 2.0, 0.0, 5.0, 1.0, 2.0];
        let mut loaded = XgbModel::load(&path, &names(), 9).unwrap();
        assert_eq!(loaded.training_rows(), 200);
        assert_eq!(loaded.predict(&probe), m.predict(&probe));
        let other = vec!["x".to_string()];
        let err = XgbModel::load(&path, &other, 1).err().unwrap();
        assert!(matches!(err, ModelError::Features { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("3 features saved, 1 in this build"),
            "{err}"
        );
        let renamed = vec!["a".to_string(), "b".to_string(), "d".to_string()];
        let err = XgbModel::load(&path, &renamed, 1).err().unwrap();
        assert!(err.to_string().contains("feature 2 is 'c'"), "{err}");
        assert!(XgbModel::load(&dir.path().join("none"), &names(), 1).is_err());
    }
}
