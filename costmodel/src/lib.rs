//! Cost models rank candidate schedules by predicted throughput, so that the search
//! spends GPU measurements only on promising ones.
//!
//! A model sees rows of analytical features (the `features` crate computes them; this
//! crate only needs their count and names) and learns the label Ansor uses: the
//! normalized throughput within a task, best time of the task / time of the row, so that
//! one model serves tasks of very different sizes. Failed candidates have label 0.
//! `XgbModel` is the real one; `RandomModel` is the baseline it must beat.

pub mod dataset;
pub mod eval;
pub mod random;
pub mod xgb;

pub use dataset::{Dataset, normalized_throughput};
pub use random::RandomModel;
pub use xgb::{RESIDUAL_ROUNDS, XgbModel, XgbParams};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("XGBoost: {0}")]
    Xgboost(String),
    #[error("cannot read model {path}: {message}")]
    Read { path: String, message: String },
    #[error("cannot write model {path}: {message}")]
    Write { path: String, message: String },
    #[error(
        "model {path} was trained on other features than this build computes ({difference}); save a new one with this build (`tilesched tune --model-out`)"
    )]
    Features { path: String, difference: String },
}

/// A retraining on all rows a model held when it was asked for, to be run on any thread
/// (so that a tuner can plan with the model it has while the next one trains) and put
/// in place with `CostModel::install`.
pub struct Fit(Box<dyn FnOnce() -> Result<Fitted, ModelError> + Send>);

impl Fit {
    pub fn run(self) -> Result<Fitted, ModelError> {
        (self.0)()
    }
}

/// What a `Fit` trained: a model from scratch, or trees fit to what the last model
/// trained from scratch still gets wrong, to be added to its predictions (`residual`).
pub struct Fitted {
    pub(crate) booster: std::sync::Arc<std::sync::Mutex<xgboost_rs::Booster>>,
    pub(crate) residual: bool,
}

/// Predicts the throughput of feature rows; learns from measured ones.
pub trait CostModel: Send {
    fn name(&self) -> &'static str;

    /// Adds measured rows; returns the retraining they call for (None: nothing to
    /// learn yet, or a model that does not train).
    fn learn(&mut self, measured: &Dataset) -> Option<Fit>;

    /// Predicts with what `fitted` learned from now on.
    fn install(&mut self, fitted: Fitted);

    /// Adds measured rows and retrains at once.
    fn update(&mut self, measured: &Dataset) -> Result<(), ModelError> {
        if let Some(fit) = self.learn(measured) {
            self.install(fit.run()?);
        }
        Ok(())
    }

    /// Scores `rows` (flattened, one row per `width` values): higher is faster.
    fn predict(&mut self, rows: &[f32]) -> Vec<f32>;

    /// Rows of training data the model holds.
    fn training_rows(&self) -> usize;

    /// Writes the model (and what it was trained on) to `path`.
    fn save(&self, path: &std::path::Path) -> Result<(), ModelError>;
}
