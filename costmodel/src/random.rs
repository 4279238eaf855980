//! The baseline model: seeded uniform random scores, whatever it is told.

use crate::{CostModel, Dataset, Fit, Fitted, ModelError};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

pub struct RandomModel {
    width: usize,
    rng: ChaCha8Rng,
    rows: usize,
}

impl RandomModel {
    pub fn new(width: usize, seed: u64) -> Self {
        RandomModel {
            width,
            rng: ChaCha8Rng::seed_from_u64(seed),
            rows: 0,
        }
    }
}

/// `n` seeded scores in [0, 1).
pub(crate) fn random_scores(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
        .collect()
}

impl CostModel for RandomModel {
    fn name(&self) -> &'static str {
        "random"
    }

    fn learn(&mut self, measured: &Dataset) -> Option<Fit> {
        self.rows += measured.len();
        None
    }

    fn install(&mut self, _: Fitted) {}

    fn predict(&mut self, rows: &[f32]) -> Vec<f32> {
        random_scores(&mut self.rng, rows.len() / self.width.max(1))
    }

    fn training_rows(&self) -> usize {
        self.rows
    }

    fn save(&self, path: &std::path::Path) -> Result<(), ModelError> {
        Err(ModelError::Write {
            path: path.display().to_string(),
            message: "a random model has nothing to save".to_string(),
        })
    }
}
